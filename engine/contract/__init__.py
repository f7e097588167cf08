"""The contract: what every room agrees on. Config model, events, run folder, task plan, data readers.

Imports neither Qt nor TensorFlow, and nothing of the other rooms.
"""
