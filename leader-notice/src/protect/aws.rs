//! AWS: EC2 Auto Scaling `SetInstanceProtection` on this instance.

use async_trait::async_trait;

use super::Protector;
use crate::{AutoScaling, NoticeError};

/// This EC2 instance in its Auto Scaling group.
pub(crate) struct AsgProtector {
    client: AutoScaling,
    group: String,
    instance: String,
}

impl AsgProtector {
    /// The protector of this instance: its id from the instance metadata, its group from
    /// `DescribeAutoScalingInstances`.
    ///
    /// # Errors
    /// [`NoticeError::Config`] if the instance is in no Auto Scaling group or no region is
    /// found; the metadata service's or Auto Scaling's error.
    pub(crate) async fn discover() -> Result<Self, NoticeError> {
        let client = AutoScaling::from_env().await?;
        let (instance, group) = client.this_instance().await?;
        Ok(Self {
            client,
            group,
            instance,
        })
    }
}

#[async_trait]
impl Protector for AsgProtector {
    fn describe(&self) -> String {
        format!(
            "EC2 instance {} in Auto Scaling group {}",
            self.instance, self.group
        )
    }

    async fn set(&self, protected: bool) -> Result<(), NoticeError> {
        self.client
            .set_instance_protection(&self.group, &self.instance, protected)
            .await
    }
}
