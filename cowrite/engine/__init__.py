"""What every engine shares: the schema contract, input parsing, record keys and partition paths,
planning and file sizing, the file-group merge, clustering, and the one commit path (:mod:`.commit`).
"""
