"""One module per subcommand; each is thin over the library layer and exposes `main`."""
