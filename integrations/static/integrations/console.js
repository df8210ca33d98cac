/* dropportal's console: copy buttons of shortened identifiers (templates/admin/console/uuid.html). */
