FROM python:3.12-slim
WORKDIR /app
COPY pyproject.toml README.md LICENSE alembic.ini ./
COPY dbqueue ./dbqueue
COPY alembic ./alembic
RUN pip install --no-cache-dir '.[singlestore]' \
    && useradd --create-home --uid 10001 dbqueue
USER dbqueue
CMD ["dbqueue", "worker"]
