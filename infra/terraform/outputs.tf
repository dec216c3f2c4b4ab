output "pipeline_root" {
  value = "gs://${google_storage_bucket.pipeline_root.name}/runs"
}

output "service_account" {
  value = google_service_account.runner.email
}

output "image_repository" {
  value = "${var.region}-docker.pkg.dev/${var.project}/${google_artifact_registry_repository.images.repository_id}"
}

output "template_repository" {
  value = "https://${var.region}-kfp.pkg.dev/${var.project}/${google_artifact_registry_repository.templates.repository_id}"
}
