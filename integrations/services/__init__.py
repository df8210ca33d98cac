"""Services: cycle, dispatch, reporting, evidence, staff, providers, and the ledger modules."""
