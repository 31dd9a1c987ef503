# HERMES Live: the Gradio app on port 7860, as a non-root user (uid 1000, as Hugging Face Spaces runs).
# No model is baked in: weights come from the Hugging Face cache at run time (mount one, or let
# the container download them when it has a network).
FROM python:3.11-slim

RUN apt-get update \
    && apt-get install -y --no-install-recommends ffmpeg \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --create-home --uid 1000 user
USER user
ENV HOME=/home/user PATH=/home/user/.local/bin:$PATH \
    GRADIO_SERVER_NAME=0.0.0.0 GRADIO_SERVER_PORT=7860
WORKDIR /home/user/app

# requirements.txt is the lock (every package pinned, docs/install.md): the image installs the set CI tested.
COPY --chown=user requirements.txt .
RUN pip install --no-cache-dir --user -r requirements.txt
COPY --chown=user . .

EXPOSE 7860
CMD ["python", "app.py"]
