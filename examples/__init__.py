"""The bundled examples, installed as ``clusterdeck_data.examples`` (the bundled presets name
``../examples/user_script.py`` relative to their own folder)."""
