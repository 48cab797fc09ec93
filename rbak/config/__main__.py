from .reference import main

raise SystemExit(main())
