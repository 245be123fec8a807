from celery import shared_task

from app.whatif import questions


@shared_task(name=questions.ANSWER_TASK)
def answer(question_id: int) -> None:
    """Replay the question's window and keep its answers on it, with progress as it goes."""
    questions.answer(question_id=question_id)
