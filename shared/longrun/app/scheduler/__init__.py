"""The scheduler's use cases: a run.create made into a run (or refused) inside one ``RunTransaction``
(``admit``). Its service drives them: the ingress consumer and the admission round
(``services/scheduler``)."""
