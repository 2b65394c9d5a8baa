"""models/kg/infobox.py: raw MediaWiki infobox values (as the organisers' open KG returns them) made readable, keys
without facts left out, and keys that belong together rendered as one row."""

from __future__ import annotations

import pytest

from models.kg.infobox import NO_FACT_KEYS, is_fact_key, pair_rows
from models.kg.wikitext import clean_value

CLEAN_CASES = [
    # {{convert}}: real conversions for the common pairs, Wikipedia's default rounding, symbols.
    ("{{convert|2737|m|ft|abbr=on}}", "2,737 m (8,980 ft)"),
    ("{{convert|2737.4|m|ft|abbr=on}}", "2,737.4 m (8,981 ft)"),
    ("{{convert|12|m|ft}}", "12 m (39 ft)"),
    ("{{convert|1200|ft|m}}", "1,200 ft (370 m)"),
    ("{{convert|5.2|km|mi}}", "5.2 km (3.2 mi)"),
    ("{{convert|26.2|mi|km}}", "26.2 mi (42.2 km)"),
    ("{{convert|891.7|km2|sqmi|abbr=on}}", "891.7 km² (344.3 sq mi)"),
    ("{{convert|100|sqmi|km2}}", "100 sq mi (260 km²)"),
    ("{{convert|100|kg|lb}}", "100 kg (220 lb)"),
    ("{{convert|150|lb|kg}}", "150 lb (68 kg)"),
    ("{{convert|1000|m2|sqft}}", "1,000 m² (11,000 sq ft)"),
    ("{{convert|20|C|F}}", "20 °C (68 °F)"),
    ("{{convert|100|F|C}}", "100 °F (38 °C)"),
    ("{{convert|-40|C|F}}", "-40 °C (-40 °F)"),
    ("{{convert|500|ha|acre}}", "500 ha (1,200 acres)"),
    ("{{convert|2737|m}}", "2,737 m (8,980 ft)"),  # no output unit: the usual one
    ("{{convert|2737|m|ft|1}}", "2,737 m (8,979.7 ft)"),  # explicit precision
    ("{{convert|10|to|20|m|ft}}", "10 to 20 m (33 to 66 ft)"),
    ("{{convert|2737|m|ft|disp=flip}}", "8,980 ft (2,737 m)"),
    ("{{cvt|330|m|ft}}", "330 m (1,100 ft)"),  # "330" is given to the tens, so is its conversion
    ("{{convert|5|furlong}}", "5 furlong"),  # unknown unit: value and unit
    ("{{convert|about|m|ft}}", "about m"),
    # Languages, formatting wrappers.
    ("{{lang|es|Puente Golden Gate}}", "Puente Golden Gate"),
    ("{{lang-fr|Tour Eiffel}}", "Tour Eiffel"),
    ("{{native name|de|Berlin}}", "Berlin"),
    ("{{small|(2023)}}", "(2023)"),
    ("{{nowrap|891.7 km<sup>2</sup>}}", "891.7 km²"),
    ("{{nobr|[[Kai Wegner]]}}", "Kai Wegner"),
    # Coordinates.
    ("{{coord|37|49|N|122|29|W|display=inline}}", "37°49′N 122°29′W"),
    ("{{coord|37|49|10|N|122|28|42|W|region:US-CA_type:landmark|display=inline,title}}",
     "37°49′10″N 122°28′42″W"),
    ("{{coord|48.8584|2.2945|type:landmark}}", "48.8584°N 2.2945°E"),
    ("{{coord|-33.8568|151.2153}}", "33.8568°S 151.2153°E"),
    # Lists.
    ("{{ubl|[[Joseph Strauss]]|[[Irving Morrow]]}}", "Joseph Strauss, Irving Morrow"),
    ("{{unbulleted list|English|Spanish|}}", "English, Spanish"),
    ("{{plainlist|\n* [[Joseph Strauss]]\n* [[Irving Morrow]]\n}}", "Joseph Strauss, Irving Morrow"),
    ("{{flatlist|\n* [[Spree]]\n* [[Havel]]\n}}", "Spree, Havel"),
    ("Rivers: {{hlist|Spree|Havel}}", "Rivers: Spree, Havel"),
    ("* Lutheran\n* Catholic", "Lutheran, Catholic"),
    # Dates.
    ("{{start date|1937|5|27}}", "May 27, 1937"),
    ("{{Start date|1937|05|27|df=y}}", "27 May 1937"),
    ("{{start date|1937|5}}", "May 1937"),
    ("{{birth date and age|1961|8|4}}", "August 4, 1961"),
    ("{{death date and age|2000|5|5|1920|6|1}}", "May 5, 2000 (aged 79)"),
    # Links.
    ("[[San Francisco Bay Area|Bay Area]], California", "Bay Area, California"),
    ("[[Golden Gate]]", "Golden Gate"),
    ("[[Berkeley, California|]]", "Berkeley, California"),
    ("[[File:Flag of Berlin.svg|20px]] [[Berlin]]", "Berlin"),
    ("[http://www.berlin.de berlin.de]", "berlin.de"),
    ("Official site[http://www.berlin.de]", "Official site"),
    ("{{URL|https://www.berlin.de/}}", "www.berlin.de"),
    # Refs, comments, entities, tags.
    ("3,878,100<ref>{{cite web|url=https://example.org|title=Population}}</ref>", "3,878,100"),
    ("3,878,100<ref name=pop/> (2023)", "3,878,100 (2023)"),
    ('227 m<ref name="ggb">Strauss 1937, p. 4</ref><!-- tower height -->', "227 m"),
    ("US$35&nbsp;million", "US$35 million"),
    ("Suspension&ndash;arch &amp; truss", "Suspension–arch & truss"),
    ("&lt;none&gt;", "<none>"),
    ("Suspension<br>truss arch<br/>truss causeways", "Suspension, truss arch, truss causeways"),
    ("Suspension,<br />truss arch", "Suspension, truss arch"),
    ("<small>est.</small> 1237", "est. 1237"),
    ("''[[Golden Gate Bridge]]''", "Golden Gate Bridge"),
    ('<span style="color:red">Red</span> line', "Red line"),
    # Unknown templates: dropped, unless one plain positional argument.
    ("{{flagicon|Germany}} [[Germany]]", "Germany"),
    ("{{increase}} 3.2%", "3.2%"),
    ("{{some template|first|second}}", ""),
    ("{{some template|kept}}", "kept"),
    ("Berlin{{efn|Including the enclaves.}}", "Berlin"),
    ("{{formatnum:3878100}}", "3,878,100"),
    ("{{jct|state=CA|US|101}}", "US 101"),
    # Whitespace.
    ("  Golden   Gate\n Bridge ", "Golden Gate Bridge"),
    ("", ""),
    # Malformed markup: best readable text, never an exception.
    ("{{convert|12|m|ft", "12 m (39 ft)"),
    ("[[San Francisco Bay Area|Bay Area", "Bay Area"),
    ("Bay Area]], California}}", "Bay Area, California"),
    ("{{lang|es|{{small|Puente}}", "Puente"),
    ("[http://www.berlin.de berlin.de", "berlin.de"),
    ("3,878,100<ref>unclosed citation", "3,878,100"),
    ("{{{{{{", ""),
    ("]]]]}}}}|", "|"),
    ("<ref", ""),
]


@pytest.mark.parametrize(("raw", "expected"), CLEAN_CASES)
def test_clean_value(raw: str, expected: str) -> None:
    assert clean_value(raw) == expected


KEY_CASES = [
    ("image", False), ("image_size", False), ("image2", False), ("image_caption", False), ("caption", False),
    ("alt", False), ("image_alt", False), ("map", False), ("map_type", False), ("map_caption", False),
    ("pushpin_map", False), ("pushpin_label_position", False), ("logo", False), ("logo_size", False),
    ("signature", False), ("coordinates_display", False), ("image_skyline", False), ("flag_size", False),
    ("mapframe_zoom", False), ("native_name_lang", False), ("Image Caption", False),
    ("height", True), ("length", True), ("coordinates", True), ("leader_name", True), ("leader_title1", True),
    ("alt_name", True), ("altitude", True), ("fleet_size", True), ("width", True), ("website", True),
    ("native_name", True), ("population_total", True), ("mapping", True), ("architectural_style", True),
    ("ship_class", True),
]


@pytest.mark.parametrize(("key", "fact"), KEY_CASES)
def test_is_fact_key(key: str, fact: bool) -> None:
    assert is_fact_key(key) is fact


def test_no_fact_keys_listed_are_filtered() -> None:
    assert {"image", "caption", "map_type", "logo", "signature", "coordinates_display"} <= NO_FACT_KEYS
    assert not any(is_fact_key(key) for key in NO_FACT_KEYS)


# A settlement infobox as the organisers' open KG stores it: 30+ keys, raw wikitext values.
CITY = {
    "name": "Berlin",
    "native_name": "{{lang|de|Berlin}}",
    "native_name_lang": "de",
    "settlement_type": "[[States of Germany|State of Germany]] and [[capital city]]",
    "image_skyline": "Berlin Montage 4.jpg",
    "imagesize": "300px",
    "image_caption": "From top: [[Brandenburg Gate]], [[Berlin Cathedral]]",
    "image_flag": "Flag of Berlin.svg",
    "image_shield": "Coat of arms of Berlin.svg",
    "pushpin_map": "Germany#Europe",
    "pushpin_map_caption": "Location within Germany",
    "coordinates": "{{coord|52|31|N|13|23|E|display=inline,title}}",
    "subdivision_type": "Country",
    "subdivision_name": "[[Germany]]",
    "leader_title": "Governing Mayor",
    "leader_name": "[[Kai Wegner]]",
    "leader_party": "[[Christian Democratic Union of Germany|CDU]]",
    "leader_title1": "Deputy Mayors",
    "leader_name1": "{{ubl|[[Franziska Giffey]] ([[Social Democratic Party of Germany|SPD]])|[[Stefan Evers]] (CDU)}}",
    "established_title": "First documented",
    "established_date": "1237",
    "area_footnotes": "<ref name=area>{{cite web|url=https://www.statistik-berlin-brandenburg.de|title=Area}}</ref>",
    "area_total_km2": "891.3",
    "area_total_sq_mi": "344.1",
    "elevation_m": "34",
    "elevation_ft": "112",
    "population_as_of": "{{start date|2023|12|31}}",
    "population_total": "3,878,100<ref>{{cite web|title=Population|publisher=Amt für Statistik}}</ref>",
    "population_density_km2": "4,100",
    "timezone": "[[Central European Time|CET]]",
    "utc_offset": "+01:00",
    "postal_code": "10115–14199",
    "area_code": "030",
    "blank_name_sec1": "[[Vehicle registration plates of Germany|Vehicle registration]]",
    "blank_info_sec1": "B",
    "website": "{{URL|https://www.berlin.de/}}",
}

CITY_ROWS = [
    ("name", "Berlin"),
    ("native_name", "Berlin"),
    ("settlement_type", "State of Germany and capital city"),
    ("coordinates", "52°31′N 13°23′E"),
    ("subdivision", "Country: Germany"),
    ("leader", "Governing Mayor: Kai Wegner"),
    ("leader_party", "CDU"),
    ("leader", "Deputy Mayors: Franziska Giffey (SPD), Stefan Evers (CDU)"),
    ("established", "First documented: 1237"),
    ("area_total", "891.3 km² (344.1 sq mi)"),
    ("elevation", "34 m (112 ft)"),
    ("population_as_of", "December 31, 2023"),
    ("population_total", "3,878,100"),
    ("population_density", "4,100/km²"),
    ("timezone", "CET"),
    ("utc_offset", "+01:00"),
    ("postal_code", "10115–14199"),
    ("area_code", "030"),
    ("Vehicle registration", "B"),
    ("website", "www.berlin.de"),
]


def test_pair_rows_city() -> None:
    assert len(CITY) >= 30
    assert pair_rows(CITY) == CITY_ROWS


def test_pair_rows_name_before_title_and_imperial_first() -> None:
    box = {"leader_name": "[[Kai Wegner]]", "elevation_ft": "112", "leader_title": "Governing Mayor",
           "elevation_m": "34", "seat": "[[Mitte]]", "seat_type": "Seat"}
    assert pair_rows(box) == [("leader", "Governing Mayor: Kai Wegner"), ("elevation", "34 m (112 ft)"),
                              ("seat", "Seat: Mitte")]


def test_pair_rows_half_a_pair() -> None:
    assert pair_rows({"leader_title": "Mayor", "leader_name": "<ref name=x/>"}) == [("leader", "Mayor")]
    assert pair_rows({"leader_title": "Mayor"}) == [("leader_title", "Mayor")]
    assert pair_rows({"elevation_m": "about 34"}) == [("elevation_m", "about 34")]


BRIDGE = {
    "bridge_name": "Golden Gate Bridge",
    "native_name": "{{lang|es|Puente Golden Gate}}",
    "image": "GoldenGateBridge-001.jpg",
    "image_size": "300px",
    "alt": "A red suspension bridge over blue water",
    "caption": "The bridge from [[Marin Headlands]] in 2018",
    "carries": "6 lanes of [[U.S. Route 101|{{jct|state=CA|US|101}}]]<br />Pedestrians and bicycles",
    "crosses": "[[Golden Gate]]",
    "locale": "[[San Francisco]], California, and [[Marin County, California|Marin County]], California",
    "design": "[[Suspension bridge|Suspension]], [[truss arch]] &amp; [[truss]] causeways",
    "material": "[[Steel]]",
    "length": "{{convert|2737.4|m|ft|abbr=on}}",
    "width": "{{convert|27.4|m|ft|abbr=on}}",
    "height": "227",
    "height_unit": "m",
    "mainspan": "{{convert|1280|m|ft|abbr=on}}",
    "clearance": "{{convert|67|m|ft|abbr=on}} at [[mean high water]]",
    "designer": "{{plainlist|\n* [[Joseph Strauss]]\n* [[Irving Morrow]]\n* [[Charles Alton Ellis]]\n}}",
    "open": "{{start date|1937|5|27}}",
    "cost": "US$35&nbsp;million<ref>{{cite book|title=Golden Gate}}</ref>",
    "traffic": "112,000 vehicles per day (2006)<ref name=traffic/>",
    "coordinates": "{{coord|37|49|10|N|122|28|42|W|region:US-CA_type:landmark|display=inline,title}}",
    "map_type": "San Francisco Bay Area",
    "map_caption": "Location in the [[San Francisco Bay Area]]",
}

BRIDGE_ROWS = [
    ("bridge_name", "Golden Gate Bridge"),
    ("native_name", "Puente Golden Gate"),
    ("carries", "6 lanes of US 101, Pedestrians and bicycles"),
    ("crosses", "Golden Gate"),
    ("locale", "San Francisco, California, and Marin County, California"),
    ("design", "Suspension, truss arch & truss causeways"),
    ("material", "Steel"),
    ("length", "2,737.4 m (8,981 ft)"),
    ("width", "27.4 m (90 ft)"),
    ("height", "227 m"),
    ("mainspan", "1,280 m (4,200 ft)"),
    ("clearance", "67 m (220 ft) at mean high water"),
    ("designer", "Joseph Strauss, Irving Morrow, Charles Alton Ellis"),
    ("open", "May 27, 1937"),
    ("cost", "US$35 million"),
    ("traffic", "112,000 vehicles per day (2006)"),
    ("coordinates", "37°49′10″N 122°28′42″W"),
]


def test_pair_rows_bridge() -> None:
    assert pair_rows(BRIDGE) == BRIDGE_ROWS


def test_two_hundred_key_infobox_cleans() -> None:
    values = [
        "{{convert|{n}|m|ft|abbr=on}}", "[[Place {n}|label {n}]], Region", "{{coord|{n}|30|N|{n}|15|W}}",
        "{{ubl|a{n}|b{n}}}", "{n}<ref>{{cite web|title=t}}</ref>", "{{start date|19{n:02d}|1|2}}",
        "{{unclosed|{n}", "[[broken {n}", "Picture {n}.jpg", "{{some|{n}|{n}}}", "&nbsp;{n}<br/>x",
    ]
    keys = ["height", "image", "leader_title", "leader_name", "caption", "elevation_m", "elevation_ft", "area_km2",
            "population", "map_type", "blank_name_sec", "blank_info_sec", "logo_size", "founded", "length"]
    box = {f"{keys[i % len(keys)]}{i // len(keys) or ''}": values[i % len(values)].format(n=i % 100)
           for i in range(200)}
    assert len(box) == 200
    rows = pair_rows(box)
    assert 0 < len(rows) < 200
    for key, text in rows:
        assert key and text
        assert not any(mark in text for mark in ("{{", "}}", "[[", "]]", "<ref", "\x1f"))
    for raw in box.values():
        assert isinstance(clean_value(raw), str)


@pytest.mark.parametrize("raw", [None, 2737, "{{" * 500, "[[" * 500 + "x", "<ref>" * 100, "{{a|" * 300 + "b"])
def test_never_raises(raw: object) -> None:
    assert isinstance(clean_value(raw), str)  # type: ignore[arg-type]


def test_a_value_the_renderer_trips_on_is_logged_and_kept_as_its_text(monkeypatch, caplog_loguru):
    import models.kg.wikitext as wikitext

    def trip(code):
        raise ValueError("a renderer bug")

    monkeypatch.setattr(wikitext, "_render", trip)
    assert clean_value("[[Paris]] &amp; Lyon") == "Paris & Lyon"  # entities decoded, leftover markup stripped
    assert "infobox value kept unrendered (ValueError: a renderer bug)" in caplog_loguru.text
