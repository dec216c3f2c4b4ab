variable "project" {
  description = "Google Cloud project ID"
  type        = string
}

variable "region" {
  description = "Region of the bucket, the repositories and the pipeline runs"
  type        = string
  default     = "us-central1"
}

variable "bucket" {
  description = "Name of the pipeline-root bucket (globally unique)"
  type        = string
}

variable "docker_repo" {
  description = "Artifact Registry Docker repository for the detpipe image"
  type        = string
  default     = "detpipe"
}

variable "kfp_repo" {
  description = "Artifact Registry KFP repository for pipeline templates"
  type        = string
  default     = "detpipe-templates"
}

variable "artifact_retention_days" {
  description = "Delete pipeline artifacts older than this many days"
  type        = number
  default     = 30
}

variable "noncurrent_version_retention_days" {
  description = "Delete overwritten or deleted versions of pipeline artifacts this many days after they stopped being current"
  type        = number
  default     = 7
}

variable "access_log_retention_days" {
  description = "Delete access logs of the pipeline-root bucket (kept in BUCKET-access-logs) older than this many days"
  type        = number
  default     = 90
}

variable "kms_key" {
  description = <<-EOT
    Cloud KMS key (projects/P/locations/L/keyRings/R/cryptoKeys/K) that encrypts the buckets
    and both Artifact Registry repositories; empty (the default) for Google-managed keys.
    The Cloud Storage and Artifact Registry service agents need
    roles/cloudkms.cryptoKeyEncrypterDecrypter on it.
  EOT
  type        = string
  default     = ""
}
