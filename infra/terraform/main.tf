# The cloud resources detpipe needs, and no more: APIs, a pipeline-root bucket that
# forgets old runs, Artifact Registry repositories for the image and the templates, and
# a service account with the least roles a run needs.
terraform {
  required_version = ">= 1.5"
  required_providers {
    google = {
      source  = "hashicorp/google"
      version = ">= 5.0"
    }
  }
}

provider "google" {
  project = var.project
  region  = var.region
}

locals {
  apis = [
    "aiplatform.googleapis.com",
    "artifactregistry.googleapis.com",
    "cloudbuild.googleapis.com",
    "compute.googleapis.com",
    "dataflow.googleapis.com",
    "iam.googleapis.com",
    "storage.googleapis.com",
  ]
  # What a pipeline run does as this account: run Vertex jobs, pull the image, launch
  # Dataflow jobs for the data step, write logs. Bucket access is granted on the bucket.
  runner_roles = [
    "roles/aiplatform.user",
    "roles/artifactregistry.reader",
    "roles/dataflow.developer",
    "roles/dataflow.worker",
    "roles/logging.logWriter",
  ]
}

resource "google_project_service" "apis" {
  for_each           = toset(local.apis)
  service            = each.value
  disable_on_destroy = false
}

resource "google_storage_bucket" "pipeline_root" {
  name                        = var.bucket
  location                    = var.region
  uniform_bucket_level_access = true
  force_destroy               = false

  lifecycle_rule {
    condition {
      age = var.artifact_retention_days
    }
    action {
      type = "Delete"
    }
  }
}

resource "google_artifact_registry_repository" "images" {
  repository_id = var.docker_repo
  location      = var.region
  format        = "DOCKER"
  description   = "detpipe container images (one image for every step)"
  depends_on    = [google_project_service.apis]
}

resource "google_artifact_registry_repository" "templates" {
  repository_id = var.kfp_repo
  location      = var.region
  format        = "KFP"
  description   = "detpipe pipeline templates for the Vertex console"
  depends_on    = [google_project_service.apis]
}

resource "google_service_account" "runner" {
  account_id   = "detpipe-runner"
  display_name = "detpipe pipeline runs"
}

resource "google_project_iam_member" "runner" {
  for_each = toset(local.runner_roles)
  project  = var.project
  role     = each.value
  member   = "serviceAccount:${google_service_account.runner.email}"
}

resource "google_storage_bucket_iam_member" "runner_bucket" {
  bucket = google_storage_bucket.pipeline_root.name
  role   = "roles/storage.objectAdmin"
  member = "serviceAccount:${google_service_account.runner.email}"
}

# Vertex runs each step as this account: it must be allowed to act as itself.
resource "google_service_account_iam_member" "runner_act_as_self" {
  service_account_id = google_service_account.runner.name
  role               = "roles/iam.serviceAccountUser"
  member             = "serviceAccount:${google_service_account.runner.email}"
}
