"""What several read domains share."""

LIST_TYPES = (
    ("email", "Email"),
    ("phone", "Phone"),
    ("ndz", "NDZ"),
    ("name_vin", "NameVIN"),
    ("maid", "MAID"),
    ("ctvid", "CTVID"),
)
