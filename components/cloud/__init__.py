"""What every Google Cloud resource a step creates carries: labels (the user's and the run's),
a customer-managed key, a network (`resources.CloudSettings`), and how a step that started a
job on Google Cloud records it for the console and cancels it when the step is stopped
(`job_cancel`)."""
