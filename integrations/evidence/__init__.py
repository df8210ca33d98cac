"""Evidence packs: signed, offline-verifiable files for a broker's auditors.

``pack`` holds the format and the signing (no Django), ``verify`` checks a pack with the
standard library and ``cryptography`` only: ``archive`` holds the archive's bytes to account,
``checks`` the signature, digests, ledger chain and cross-checks. ``services.evidence.evidence``
writes packs. ``directives`` is the format of the signed CSV a service provider gets
(``services.providers.directives`` issues them), and ``signing_key`` loads the evidence key
that signs both from the settings.
"""
