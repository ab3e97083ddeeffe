"""One module per `vdkit` verb: argument declarations (cheap) and the function that runs it."""
