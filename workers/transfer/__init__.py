"""Export a deployment's sessions to JSON Lines and import them into another
(`memq export`, `memq import`): :mod:`.format` is the line format,
:mod:`.export` reads SQL, :mod:`.importer` publishes through the stream."""
