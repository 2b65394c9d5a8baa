"""Open-domain KG rows with the real MiniLM: the fixture KG's raw MediaWiki infoboxes, the scripted LLM naming the
entity as the question writes it, and the rows that reach the reasoning prompt within `kg.max_chars`."""

import json

from models.system import CragSystem
from tests.conftest import to_batch
from tests.fakes import RecordingKG, ScriptedLLM, by_prompt, prompt_name
from tests.integration.conftest import unhurried

CASES = [  # question, the entity as written, a line that must reach the prompt
    ("how tall is the eiffel tower?", "eiffel tower", "Eiffel Tower height: 330 m (1,100 ft)"),
    ("who is the mayor of berlin?", "berlin", "Berlin leader: Governing Mayor: Kai Wegner (CDU)"),
    # no row shares "long" with the question, the bag-of-words embedder leaves this row out, and 29 rows of the
    # bridge and of the strait "Golden Gate" compete for 1,000 characters
    ("how long is the golden gate bridge?", "golden gate bridge", "Golden Gate Bridge length: 2,737.4 m (8,981 ft)"),
    ("who was the chief engineer of the golden gate bridge?", "golden gate bridge",
     "Golden Gate Bridge designer: Joseph Strauss, Charles Alton Ellis, Leon Moisseiff"),
]


def test_open_questions_get_the_row_that_answers_them(cpu_config, sample_examples, embedder):
    entity_of = {question: entity for question, entity, _ in CASES}

    def extraction(conversation):
        question = conversation[1]["content"].rsplit("Question: ", 1)[-1].splitlines()[0].strip()
        return json.dumps({"domain": "open", "entities": {"main_entity": entity_of[question]}})

    llm = ScriptedLLM(by_prompt(kg_entities=extraction))
    cpu_config.task = 2
    system = CragSystem(unhurried(cpu_config), llm=llm, embedder=embedder, given={"kg": RecordingKG.over_fixtures()})
    try:
        examples = [dict(sample_examples[4], interaction_id=f"q{i}", query=q) for i, (q, _, _) in enumerate(CASES)]
        system.batch_generate_answer(to_batch(examples))
    finally:
        system.close()
    prompts = {}
    for conversations, _ in llm.calls:
        for conversation in conversations:
            if prompt_name(conversation) == "reasoning":
                user = conversation[1]["content"]
                prompts[user.rsplit("Question: ", 1)[-1].splitlines()[0].strip()] = user
    for question, _, line in CASES:
        section = prompts[question].split("### Knowledge graph")[1].split("\n### ")[0]
        lines = [text.removeprefix("- ") for text in section.strip().splitlines() if text.startswith("- ")]
        assert line in lines, (question, lines)
        assert sum(map(len, lines)) <= cpu_config.section("kg").max_chars
        assert not any(mark in text for text in lines for mark in ("{{", "[[", "<ref", ".jpg"))
