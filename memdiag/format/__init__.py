"""The run directory's format in one place: file names, records, their layout, results, manifest, writer, reader.

- :mod:`memdiag.format.records`: one typed class per record type of ``rank-K.jsonl``;
- :mod:`memdiag.format.results`: ``summary.json``, ``compare.json``, ``scale.json`` and a prediction, typed;
- :mod:`memdiag.format.layout`: how a rank file is laid out (its version, which steps keep their samples,
  a collective's kind);
- :mod:`memdiag.format.writer`: a rank's record writer, which takes the typed records;
- :mod:`memdiag.format.reader`: a run read back, every record kind in its own typed list; the only
  parser of a record line;
- :mod:`memdiag.format.manifest`: ``run.json``, typed, written and read here;
- :mod:`memdiag.format.rundir`: every file name, the kinds of directory, atomic JSON.

docs/reference/records.md and docs/reference/run-directory.md are the references.
"""
