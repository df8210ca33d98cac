"""The broker's own consumer pipeline: from a file or an API body to its consumer hashes.

- ``readers``: a CSV file's or a Parquet table's rows as hashed records, or why a row is bad;
  ``api_reader``: the same for the API's JSON objects.
- ``sources``: where a file comes from (a path, standard input, S3) and its format.
- ``workers``: hashing on every core; a batch of records as staging rows (COPY text).
- ``load``: one call's staging, and the merge path it picks, one module each:
  ``merge_streamed`` (a broker's first set in key order, merged as it is read),
  ``merge_general`` (everything else, merged once all is read) and ``fresh_partition``
  (the partition a broker's first set fills, indexed and attached at the end).

Nothing here opens a transaction, takes a lock or writes a ledger event: the services of
``integrations.services.cycle.consumers`` do, and call this package inside their transaction.
"""
