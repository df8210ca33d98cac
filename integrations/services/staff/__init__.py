"""What staff configure and watch: brokers, targets, keys, roles, MFA, alerts."""
