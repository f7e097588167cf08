"""The control side: launcher, run lifecycle, supervisors and their transports, pre-launch checks, export.

Starts and stops task processes; never imports TensorFlow (that lives in :mod:`engine.runtime`).
"""
