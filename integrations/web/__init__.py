"""HTTP plumbing shared by the API and the operations endpoints: problem details (RFC 9457),
API-key permissions, the throttles and content negotiation."""
