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
  # What a pipeline run does as this account: run Vertex jobs, pull the image, run
  # Dataflow workers, write logs. Launching Dataflow jobs is granted apart (below), bucket
  # access on the bucket.
  runner_roles = [
    "roles/aiplatform.user",
    "roles/artifactregistry.reader",
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
  public_access_prevention    = "enforced" # datasets, models and reports never become public by an ACL
  force_destroy               = false

  # Versions guard against an overwrite or delete by mistake; the rules below bound what
  # they cost: live objects expire after artifact_retention_days, old versions after
  # noncurrent_version_retention_days.
  versioning {
    enabled = true
  }

  lifecycle_rule {
    condition {
      age = var.artifact_retention_days
    }
    action {
      type = "Delete"
    }
  }

  lifecycle_rule {
    condition {
      days_since_noncurrent_time = var.noncurrent_version_retention_days
      with_state                 = "ARCHIVED"
    }
    action {
      type = "Delete"
    }
  }

  logging {
    log_bucket = google_storage_bucket.access_logs.name
  }

  dynamic "encryption" {
    for_each = var.kms_key == "" ? [] : [var.kms_key]
    content {
      default_kms_key_name = encryption.value
    }
  }
}

# Access logs of the pipeline-root bucket (who read or wrote which object, when).
resource "google_storage_bucket" "access_logs" {
  #checkov:skip=CKV_GCP_62:this is the access-log bucket; logging its own access would log the logs
  #checkov:skip=CKV_GCP_78:log objects are written once and never overwritten; versions would only add cost
  name                        = "${var.bucket}-access-logs"
  location                    = var.region
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  force_destroy               = false

  lifecycle_rule {
    condition {
      age = var.access_log_retention_days
    }
    action {
      type = "Delete"
    }
  }

  dynamic "encryption" {
    for_each = var.kms_key == "" ? [] : [var.kms_key]
    content {
      default_kms_key_name = encryption.value
    }
  }
}

# Cloud Storage writes the usage logs as this group.
resource "google_storage_bucket_iam_member" "access_log_writer" {
  bucket = google_storage_bucket.access_logs.name
  role   = "roles/storage.objectCreator"
  member = "group:cloud-storage-analytics@google.com"
}

resource "google_artifact_registry_repository" "images" {
  #checkov:skip=CKV_GCP_84:customer-managed keys are opt-in through var.kms_key; Google-managed keys are the default
  repository_id = var.docker_repo
  location      = var.region
  format        = "DOCKER"
  description   = "detpipe container images (one image for every step)"
  kms_key_name  = var.kms_key == "" ? null : var.kms_key
  depends_on    = [google_project_service.apis]
}

resource "google_artifact_registry_repository" "templates" {
  #checkov:skip=CKV_GCP_84:customer-managed keys are opt-in through var.kms_key; Google-managed keys are the default
  repository_id = var.kfp_repo
  location      = var.region
  format        = "KFP"
  description   = "detpipe pipeline templates for the Vertex console"
  kms_key_name  = var.kms_key == "" ? null : var.kms_key
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

# The data step launches its Dataflow job (DataflowRunner) as this account.
resource "google_project_iam_member" "runner_dataflow_launch" {
  #checkov:skip=CKV_GCP_49:roles/dataflow.developer is the least role that lets the data step launch its Dataflow job
  project = var.project
  role    = "roles/dataflow.developer"
  member  = "serviceAccount:${google_service_account.runner.email}"
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
