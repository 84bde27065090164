"""An endpoint plugin: a factory returning an object with ``attach_router(app)``.

Endpoint plugins are opt-in: forkless loads this one only when FORKLESS_PLUGINS lists
``example_hello``.
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
