"""The cost model: pure functions from operators and steps to seconds (roofline, kernel shapes, collectives, memory plan)."""
