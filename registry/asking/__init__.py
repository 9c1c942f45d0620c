"""Asking an endpoint ourselves (`registry ask`): a versioned prompt, answer extraction and grading, an API client,
and the run that stores the graded answers and says what they show."""
