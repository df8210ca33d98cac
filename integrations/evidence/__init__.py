"""Evidence packs: signed, offline-verifiable files for a broker's auditors.

``pack`` holds the format and the signing (no Django), ``verify`` checks a pack with the
standard library and ``cryptography`` only; ``services.evidence`` writes packs.
"""
