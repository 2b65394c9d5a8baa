"""A CRAG-compatible knowledge-graph server over fixture files, for tests and the offline demo.

Serves the 38 endpoints of the CRAG mock API (`POST /<domain>/<function>`, the organisers' request bodies,
reply {"result": ...}) from data/kg/{open,movie,finance,music,sports}.json, which hold the organisers' data
layout (see data/kg/README.md). Each endpoint behaves as the organisers' mock API does (facebookresearch/CRAG,
mock_api/server.py and mock_api/cragapi/*.py), so a client or stage that works here works there:

- Name searches are BM25, not fuzzy matching. The query and the names are normalised alike (lower case, "_" to
  a space, ASCII punctuation removed, whitespace collapsed: "Joseph Gordon-Levitt" -> "joseph gordonlevitt").
  movie_get_movie_info / movie_get_person_info return the top 10 entity dicts, finance_get_company_name and
  open_search_entity_by_name the top 10 names; all four use rank_bm25's BM25Okapi and leave out names scoring 0.
  The music searches use the organisers' own BM25 (k1 1.5, b 0.75, terms under an IDF cut-off dropped) and
  return every name sharing a kept term, at most 10.
- Every other key is matched exactly, case included: movie ids, tickers ("aapl" finds nothing), company names
  ("Apple Inc."), artist and song names, open entity names, Billboard dates, NBA team names (SQL `=`), soccer
  team names as the organisers' data writes them ("Manchester Utd", not "Manchester United").
- Nothing found is a null result (`{"result": null}`), except: music_get_lifespan [null, null];
  music_get_billboard_rank_date [null, null] for an unknown rank and [[], []] for a date without that rank;
  grammy counts 0; grammy by-year lists [] for a year in 1957-2019 without a row and null outside it.
- Errors are theirs: movie_get_year_info answers HTTP 500 for a year outside 1990-2021 or one that is not a
  number; a body that does not fit the endpoint's request model (missing key, wrong type) answers 422. The
  sports endpoints turn every failure into a null result, as theirs do.
- Shapes are theirs: the sports results are pandas DataFrame.to_json() layouts ({column: {row key: value}});
  soccer row keys are the str() of the (league, season, team, game) index tuple and dates are ISO strings with
  milliseconds; NBA row keys are "0", "1", ...

Where this server still differs from theirs, and why:
- The music searches drop terms whose IDF is at most 1.0, theirs at most 4: with the few dozen names of a
  fixture every term's IDF is under 4, and their cut-off would leave no term at all (their index then fails to
  build). Common words ("the") therefore still count here when they are rare in the fixture.
- music_get_members answers the stored members without duplicates in stored order; theirs goes through a set,
  whose order changes from one server process to the next.
- BM25 ties keep numpy's argsort order, as theirs do; numpy 2 (here) may order equal scores differently from
  the numpy 1 theirs pins.
- Pandas is not needed: the DataFrame layouts are written directly (as pandas 2 writes them) and the NBA tables
  live in an in-memory SQLite database queried with the organisers' SQL. Floats are written as Python writes
  them, where pandas rounds to 10 significant digits.
- An HTTP 500 here is a plain-text "Internal Server Error" written by this server (theirs: uvicorn's), and a
  422 names the problem in FastAPI's style without being byte-identical.

    python tools/kg_server.py --port 8000                 # then CRAG_MOCK_API_URL=http://127.0.0.1:8000
    python tools/kg_server.py --port 0 --faults           # tests: odd argument values trigger failures

With --faults, an argument "__slow__" delays the reply by --slow-s seconds, "__500__" answers HTTP 500 (as a
raising endpoint does), "__503__" answers HTTP 503 (a gateway or a starting server), "__garbage__" answers a body
that is not JSON, and "__wrongtype__" answers a result of the wrong type.
"""
