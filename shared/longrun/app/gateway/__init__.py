"""The gateway's use cases: an operator's acts on runs (``operate``) and a webhook's intake
(``webhooks``), each inside one ``RunTransaction``."""
