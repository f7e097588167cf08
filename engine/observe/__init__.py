"""The observation fold: events folded into run state (per replica histories, task states, stragglers).

The same code serves the command line, the desktop app and the Keras callback. No Qt, no TensorFlow.
"""
