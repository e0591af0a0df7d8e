from memq.workers.cli import app

app()
