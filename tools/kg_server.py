"""The fixture KG server over data/kg (evaluation/kg_fixture; `python -m evaluation.kg_fixture` is the same).

    python tools/kg_server.py --port 8000                 # then CRAG_MOCK_API_URL=http://127.0.0.1:8000
    python tools/kg_server.py --port 0 --faults           # tests: odd argument values trigger failures
"""

from __future__ import annotations

import sys

from evaluation.kg_fixture.serve import main

if __name__ == "__main__":
    sys.exit(main())
