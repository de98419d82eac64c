"""The Hudi table format, version 8: instants and the timeline, hoodie.properties and the settings,
commit and service metadata (JSON and Avro), the file system view, markers and the completion-time overlay.

Knows what the files mean, not who writes them: no locks, no engine.
"""
