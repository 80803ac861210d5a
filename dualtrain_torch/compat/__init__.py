"""Drop-in replacements for other tools' APIs, built on dualtrain (torch side)."""
