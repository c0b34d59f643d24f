from harness.registry.generations import require_supported_stack

require_supported_stack()  # before anything imports torch or torchtitan

from harness.cli.commands import main  # noqa: E402

raise SystemExit(main())
