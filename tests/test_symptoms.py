"""The symptom index (notebooks/appendix/symptoms.toml → symptom_index.md): every entry names a notebook section that
exists, and the page is written from the entries (test_manifest's drift check). That each message is printed by its
notebook is checked where the notebook runs (tests/conftest.py, run_notebook); here, that the check can fail."""
import nbformat

from course_utils.tooling import symptoms


def test_every_entry_names_a_notebook_section_that_exists():
    assert symptoms.problems() == []


def test_the_index_covers_the_problems_people_file():
    entries = symptoms.load()
    assert len(entries) >= 18, "the index lists at least the course's reproduced problems"
    assert all(e.cause.strip() and e.fix.strip() for e in entries)
    assert len({e.notebook for e in entries}) >= 8, "problems from across the course, not one notebook"


def test_a_changed_message_is_caught():
    entry = next(e for e in symptoms.load())
    number = entry.notebook
    stem = symptoms.notebook_path(number).stem
    ours = [e.message for e in symptoms.load() if e.notebook == number]

    def executed(text: str) -> nbformat.NotebookNode:
        nb = nbformat.v4.new_notebook()
        cell = nbformat.v4.new_code_cell("")
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
        nb.cells.append(cell)
        return nb

    assert symptoms.missing(stem, executed("\n".join(ours))) == []
    changed = "\n".join(ours).replace(entry.message, entry.message[:-3] + "???")
    assert symptoms.missing(stem, executed(changed)) == [entry.message]
    error = nbformat.v4.new_output("error", ename="ValueError", evalue="x", traceback=[])
    nb = executed("")
    nb.cells[0].outputs = [error]
    assert "ValueError: x" in symptoms.output_text(nb)
