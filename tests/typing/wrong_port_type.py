"""What `make lint` checks mypy refuses: a value of the wrong type written to a declared feature field, and a read
used as another type. Never imported or run; each line marked `expect:` must be an error and no other line."""

from models.kg.kg_stage import KG_RESULTS
from models.state import QueryState

state = QueryState(0, "q1", "who?", "03/01/2024", [])
state[KG_RESULTS] = "movie: Inception"  # expect: a str is not the field's list[str]
count: int = state[KG_RESULTS]  # expect: a list[str] is not an int
state[KG_RESULTS] = ["movie: Inception"]
