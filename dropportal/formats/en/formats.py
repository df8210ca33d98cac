"""English date formats with the zone's abbreviation after every time (PST, PDT, UTC).

The admin shows times in DROP's zone (``DROPPORTAL_DROP_TIMEZONE``); saying which zone on
each one leaves no guessing. Exports write ISO 8601 in UTC and do not use these.
"""

DATETIME_FORMAT = "M j, Y, H:i T"
SHORT_DATETIME_FORMAT = "M j, H:i T"
TIME_FORMAT = "H:i T"
DATE_FORMAT = "M j, Y"
