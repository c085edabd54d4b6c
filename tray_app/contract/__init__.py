"""The words the service, the tray, the drill and the tests share, each defined once: job states, worker
states, failure kinds, reason codes, roles, the events on `/failsoft/events` and the shapes of the status
and job answers. A leaf: it imports nothing of Failsoft's."""
