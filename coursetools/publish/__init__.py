"""The course in other forms: the website (`make.py site`) and the Chinese edition
(`make.py i18n`)."""
