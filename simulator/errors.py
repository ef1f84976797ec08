"""The one exception type for bad user input (files, fields, values).

The CLI turns it into a one-line message and exit code 2; library callers can catch it.
"""


class InputError(ValueError):
    """Bad input from the user: a config file, a field, a flag value.

    The message must name the file or option, the field and what is allowed.
    """
