"""What NOT to do: this plugin defines a new class object on every call and registers the
object instead of a path. Each process gets a different class, and calling the plugin a
second time replaces the registration — `forkless plugins check` reports it."""


def register() -> None:
    from forkless import ModelRegistry

    class FreshModelEveryCall:  # a new object each time register() runs
        pass

    ModelRegistry.register_model("NonReentrantForCausalLM", FreshModelEveryCall)
