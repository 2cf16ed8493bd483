# Endpoints of docker/compose.yaml, for the integration tests: `. docker/env.sh`
export LEADER_EMULATORS_REQUIRED=1
export AZURITE_BLOB_ENDPOINT=http://127.0.0.1:10000/devstoreaccount1
export AWS_ENDPOINT_URL=http://127.0.0.1:4566
export AWS_ACCESS_KEY_ID=test
export AWS_SECRET_ACCESS_KEY=test
export AWS_REGION=us-east-1
export AWS_DEFAULT_REGION=us-east-1
export AWS_EC2_METADATA_DISABLED=true
export STORAGE_EMULATOR_HOST=http://127.0.0.1:4443
export LEADER_ETCD_ENDPOINT=http://127.0.0.1:2379
export LEADER_ZOOKEEPER_ENDPOINT=127.0.0.1:2181
