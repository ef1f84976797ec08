"""Validation against published measurements: the table, replay, cross-validation, error bands, a user's benchmark."""
