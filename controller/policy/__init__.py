"""The policy lifecycle: text in, one built policy running, every change versioned.

One concept per module; imports point down this list and never back up:

    document.py  the policy text: the default, the size limit, bytes -> text
    files.py     atomic writes that keep the file's mode, and a file's signature
    versions.py  numbered versions on disk (``VersionLog``)
    build.py     ``validate_and_build(text)``: the one accept/reject decision
    running.py   ``RunningPolicy``: a built policy with its version, read on every request
    store.py     ``PolicyStore``: the one place the running policy changes
    watcher.py   ``PolicyWatcher``: external edits of the live file -> the store
    source.py    ``PolicySource``: the daemon's store + watcher task + version gauge

``PUT /admin/policy`` (and its validate endpoint), the file watcher and ``draftctl config
check`` all go through ``validate_and_build``, so they accept and reject the same texts.
"""
