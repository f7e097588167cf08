"""ClusterDeck's engine.

The *control* half (``config``, ``cluster``, ``events``, ``telemetry``,
``launcher``, ``supervisor``, ``cli``) imports no TensorFlow and no Qt. The
*runtime* half (``engine.runtime``) runs inside task processes and is the only
code that imports TensorFlow.
"""

__version__ = "0.1.0"
