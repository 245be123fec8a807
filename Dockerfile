# Prefixscope's image: web (gunicorn), Celery worker and beat, and the KV-event collectors.
# One image, several commands; docker-compose.yml picks the command per service.

# The browser's chart library (uPlot), installed from package-lock.json by npm in a stage of its own:
# the image that runs needs its files (collected below as static files), not Node.
FROM node:20-slim AS browser-libraries
WORKDIR /build
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund

FROM python:3.11-slim

# PYTHONPATH: import the source tree in /app rather than the copy in site-packages, so that BASE_DIR
# (templates/, static/, .data/static) resolves to /app for every process (gunicorn, celery, manage.py).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app

WORKDIR /app

# A C compiler and OpenSSL's headers build app/domain/_chain.c, the block-hash chain in C.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libssl-dev \
    && rm -rf /var/lib/apt/lists/*

# Dependencies first: this layer is rebuilt only when the lock changes.
COPY requirements.lock ./
RUN pip install -r requirements.lock

COPY . .
COPY --from=browser-libraries /build/node_modules ./node_modules
# Installed editable, so that the C extension is built beside its source in /app (PYTHONPATH).
# collectstatic runs with DEBUG off so that whitenoise's manifest storage writes its manifest;
# the secret key below exists only for this build step and is never used at run time.
RUN pip install --no-deps -e . \
    && rm -rf build \
    && DJANGO_DEBUG=false DJANGO_SECRET_KEY=collectstatic-build-only \
       python manage.py collectstatic --noinput

# The code stays owned by root (read-only for the app); the process runs unprivileged.
RUN useradd --system --uid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin prefixscope
USER prefixscope

EXPOSE 8000
# gunicorn also reads /app/gunicorn.conf.py (workers from WEB_CONCURRENCY, threads, access log).
CMD ["gunicorn", "app.wsgi:application", "--bind", "0.0.0.0:8000"]
