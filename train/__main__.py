from train.cli import app

app(prog_name="python -m train")
