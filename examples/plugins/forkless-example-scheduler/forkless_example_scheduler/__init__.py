"""A scheduler class for ``forkless serve --scheduler-cls forkless_example_scheduler:ShortPromptScheduler``.

The built-in scheduler already implements every method of ``SchedulerInterface``; this
one changes one of them: ``add_request`` refuses prompts longer than MAX_PROMPT_TOKENS,
so the client gets an error at once instead of waiting behind the queue.
"""

from forkless.core.sched import Scheduler

MAX_PROMPT_TOKENS = 256


class ShortPromptScheduler(Scheduler):
    def add_request(self, request) -> None:
        if request.num_prompt_tokens > MAX_PROMPT_TOKENS:
            raise ValueError(f"request {request.request_id!r}: the prompt has "
                             f"{request.num_prompt_tokens} tokens; this server accepts at most "
                             f"{MAX_PROMPT_TOKENS}")
        super().add_request(request)
