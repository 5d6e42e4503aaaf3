"""The HTTP face: app wiring, auth, job access, parameters, errors turned into answers, routes.
The top room: it may import every other."""
