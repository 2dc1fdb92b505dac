"""Runs that prove the course where learners are: every notebook alone as in Colab
(standalone), on other PyTorch releases (`make.py test-torch`: torchrange) and on a GPU
(`make.py gpu-report`)."""
