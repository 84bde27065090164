"""An endpoint plugin: a factory returning an object with ``attach_router(app)``.

Endpoint plugins are opt-in: forkless loads this one only when FORKLESS_PLUGINS names it.
``FORKLESS_PLUGINS=+example_hello`` loads every plugin that loads by default, plus this one.
"""


class HelloEndpoints:
    def attach_router(self, app) -> None:
        from fastapi import APIRouter

        router = APIRouter()

        @router.get("/example/hello")
        async def hello() -> dict:
            return {"hello": "from forkless-example-endpoint"}

        app.include_router(router)


def make_plugin() -> HelloEndpoints:
    return HelloEndpoints()
