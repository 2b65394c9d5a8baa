"""`python -m evaluation.kg_fixture`: the fixture KG server (evaluation/kg_fixture/serve.py)."""

import sys

from evaluation.kg_fixture.serve import main

sys.exit(main())
