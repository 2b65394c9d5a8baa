// report.html and compare.html (evaluation/html_report.py): the question table's filters and the record panel.
// The page carries its records as JSON (#records); every text reaches the page through textContent, never as HTML.
"use strict";
(function () {
  const records = new Map(JSON.parse(document.getElementById("records").textContent).map((r) => [r.id, r]));
  const rows = Array.from(document.querySelectorAll("#question-table tbody tr"));
  const filters = Array.from(document.querySelectorAll("select[data-field]"));
  const search = document.getElementById("filter-text");
  const shown = document.getElementById("shown");
  const dialog = document.getElementById("record");

  function applyFilters() {
    const wanted = filters.filter((f) => f.value).map((f) => [f.dataset.field, f.value]);
    const text = search ? search.value.trim().toLowerCase() : "";
    let count = 0;
    for (const row of rows) {
      const keep = wanted.every(([field, value]) => row.dataset[field] === value) &&
        (!text || row.textContent.toLowerCase().includes(text));
      row.hidden = !keep;
      count += keep ? 1 : 0;
    }
    shown.textContent = `${count} of ${rows.length} questions shown`;
  }

  function element(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  // `text` with every case-insensitive occurrence of a gold answer wrapped in <mark>.
  function highlighted(tag, className, text, golds) {
    const node = element(tag, className);
    const value = String(text ?? "");
    const needles = golds.filter((g) => g && g.length > 1).map((g) => g.toLowerCase());
    const lower = value.toLowerCase();
    let at = 0;
    while (at < value.length) {
      let next = -1, length = 0;
      for (const needle of needles) {
        const found = lower.indexOf(needle, at);
        if (found >= 0 && (next < 0 || found < next)) { next = found; length = needle.length; }
      }
      if (next < 0) break;
      node.append(value.slice(at, next), element("mark", null, value.slice(next, next + length)));
      at = next + length;
    }
    node.append(value.slice(at));
    return node;
  }

  function section(spec, golds) {
    const wrap = element("section");
    wrap.append(element("h4", null, spec.title));
    if (spec.kind === "list") {
      const list = element("ol");
      for (const item of spec.items) {
        const entry = element("li", item.gold ? "has-gold" : "");
        if (item.head) entry.append(element("div", "head", item.head));
        entry.append(highlighted("div", "text", item.text, golds));
        list.append(entry);
      }
      wrap.append(list);
    } else if (spec.kind === "table") {
      const table = element("table");
      const head = element("tr");
      spec.columns.forEach((c) => head.append(element("th", null, c)));
      table.append(head);
      for (const cells of spec.rows) {
        const row = element("tr");
        cells.forEach((c) => row.append(element("td", null, c)));
        table.append(row);
      }
      wrap.append(table);
    } else {
      wrap.append(highlighted("pre", null, spec.text, golds));
    }
    return wrap;
  }

  function openRecord(id) {
    const record = records.get(id);
    if (!record) return;
    const panel = element("div", "panel");
    const header = element("header");
    header.append(highlighted("h3", null, record.title, []));
    const close = element("button", "close", "\u00d7");
    close.setAttribute("aria-label", "close");
    close.addEventListener("click", () => dialog.close());
    header.append(close);
    panel.append(header);
    const facts = element("dl");
    for (const [label, value, mark] of record.facts) {
      facts.append(element("dt", null, label), highlighted("dd", null, value, mark ? record.golds : []));
    }
    panel.append(facts);
    record.sections.forEach((spec) => panel.append(section(spec, record.golds)));
    dialog.replaceChildren(panel);
    dialog.dataset.id = id;
    if (!dialog.open) dialog.showModal();
    history.replaceState(null, "", `#q=${encodeURIComponent(id)}`);
  }

  filters.forEach((f) => f.addEventListener("change", applyFilters));
  if (search) search.addEventListener("input", applyFilters);
  for (const row of rows) {
    row.addEventListener("click", () => openRecord(row.dataset.id));
    row.addEventListener("keydown", (event) => { if (event.key === "Enter") openRecord(row.dataset.id); });
  }
  dialog.addEventListener("close", () => history.replaceState(null, "", location.pathname + location.search));
  dialog.addEventListener("click", (event) => { if (event.target === dialog) dialog.close(); });
  applyFilters();
  const linked = /^#q=(.+)$/.exec(location.hash);
  if (linked) openRecord(decodeURIComponent(linked[1]));
})();
