"""The status page (`/ui/`): plain HTML, CSS and JavaScript from the package, live through the event
stream; a login with the admin token kept in an HttpOnly, SameSite=Strict cookie."""
